# triton-actor: a Triton-compatible inference server (HTTP 8000, gRPC 8001, metrics 8002).
#   docker build -t triton-actor:0.1.0 .
#   docker run -p 8000-8002:8000-8002 triton-actor:0.1.0                       # the bundled example models
#   docker run -p 8000-8002:8000-8002 -v $PWD/models:/models triton-actor:0.1.0 --model-repository=/models
#   docker run -e AWS_ACCESS_KEY_ID -e AWS_SECRET_ACCESS_KEY triton-actor:0.1.0 --model-repository=s3://bucket/repo
# Build arguments: EXTRAS (pip extras; add "torch" together with TORCH=torch==2.13.0 for TorchScript
# models), WITH_EXAMPLES=1 to generate the ONNX/TorchScript examples (scripts/make_examples.py).
FROM python:3.11-slim

ARG EXTRAS=onnx,s3
ARG TORCH=
ARG WITH_EXAMPLES=0
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/triton-actor
COPY pyproject.toml setup.cfg README.md ./
COPY triton_actor ./triton_actor
COPY scripts ./scripts
COPY model_repository ./model_repository
RUN pip install ".[${EXTRAS}]" ${TORCH} \
    && if [ "${WITH_EXAMPLES}" = "1" ]; then python scripts/make_examples.py --repo model_repository; fi \
    && groupadd --system --gid 10001 triton \
    && useradd --system --uid 10001 --gid triton --home-dir /nonexistent --shell /usr/sbin/nologin triton

# numeric, so Kubernetes' runAsNonRoot can verify it (deploy/kubernetes/deployment.yaml runs as 10001 too)
USER 10001
EXPOSE 8000 8001 8002
# ready = every model loaded (--strict-readiness); assumes the default --http-port
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4)"]
# SIGTERM drains in-flight requests for up to --exit-timeout-secs, then unloads the models
STOPSIGNAL SIGTERM
ENTRYPOINT ["triton-actor"]
CMD ["--model-repository=/opt/triton-actor/model_repository"]
