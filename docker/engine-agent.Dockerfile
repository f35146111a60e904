# The engine agent (one per GPU server). It carries only its own dependencies: no SQLAlchemy,
# no tracker, no simulator. Build from the repository root:
#   docker build -f docker/engine-agent.Dockerfile -t prorsa-engine-agent .
# On a GPU server, build it on the SGLang image the agent's flags are checked against (the
# compose "gpu" profile does: BASE=lmsysorg/sglang:v0.5.23) and point PRORSA_AGENT_PYTHON
# at that image's interpreter, so the agent launches `python -m sglang.launch_server` there.
ARG BASE=python:3.12-slim
FROM ${BASE}
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
RUN uv sync --frozen --no-dev --package prorsa-engine-agent
RUN useradd --system --uid 10001 prorsa && mkdir -p /data && chown prorsa /data
USER prorsa
EXPOSE 9100
CMD ["python", "-m", "prorsa_engine_agent", "--config", "/etc/prorsa/agent.toml"]
