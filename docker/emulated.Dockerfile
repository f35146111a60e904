# The emulated cluster profile: emulated SGLang engines and router (prorsa-sim) and the
# rollout driver; the engine agent in this image launches emulated engines. Build:
#   docker build -f docker/emulated.Dockerfile -t prorsa-emulated .
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
RUN uv sync --frozen --no-dev --package prorsa
RUN useradd --system --uid 10001 prorsa && mkdir -p /data && chown prorsa /data
USER prorsa
EXPOSE 30080 9100
CMD ["python", "-m", "prorsa_emulated", "router", "--host", "0.0.0.0", "--port", "30080"]
