# The allocator service. Build from the repository root:
#   docker build -f docker/allocator.Dockerfile -t prorsa-allocator .
FROM python:3.12-slim
COPY --from=ghcr.io/astral-sh/uv:0.13.8 /uv /bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never PATH=/app/.venv/bin:$PATH
WORKDIR /app
COPY pyproject.toml uv.lock ./
COPY schemas schemas
COPY runtime runtime
COPY sdk sdk
COPY cli cli
COPY services services
COPY emulated emulated
COPY sim sim
# The prorsa command (its sub-commands run every service); no dev dependencies.
RUN uv sync --frozen --no-dev --package prorsa
RUN useradd --system --uid 10001 prorsa && mkdir -p /data && chown prorsa /data
USER prorsa
EXPOSE 9100
CMD ["prorsa", "allocator", "run"]
