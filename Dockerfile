# twinwatch: the service (default command) or the built-in twin (`twin ...`), one image.
# Two stages: the build stage installs the plain package (no torch: serving runs the models'
# ONNX graphs) into a venv; the runtime stage copies the venv, nothing else (no source tree, no
# compilers, no pip cache). The migrations and the shipped models are inside the package.

# Debian 12 (bookworm), as the base CI makes (deploy/container-check.sh) and measures.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies before the code, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
COPY app/__init__.py app/py.typed app/
# Behind a proxy that intercepts TLS, hand its CA bundle in as a build secret
# (`--secret id=ca-certificates,src=/etc/ssl/certs/ca-certificates.crt`): pip trusts it while it
# runs, and it is in no layer of any image.
RUN --mount=type=secret,id=ca-certificates,required=false \
    if [ -s /run/secrets/ca-certificates ]; then export PIP_CERT=/run/secrets/ca-certificates; fi \
    && pip install . && pip uninstall --yes twinwatch
COPY app app
RUN --mount=type=secret,id=ca-certificates,required=false \
    if [ -s /run/secrets/ca-certificates ]; then export PIP_CERT=/run/secrets/ca-certificates; fi \
    && pip install --no-deps .
# The same service in less room: no test suites, no pip or setuptools, no bytecode (a sixth of
# the image: the service compiles what it imports when it starts), extension modules without
# their symbol tables (not the libraries wheels bundle in `*.libs`: rewritten when the wheel was
# made, stripping breaks them), and ONNX Runtime without its C API library and offline tools
# (its Python module, which runs the inference graphs, links neither).
# (binutils strips, in this stage only: whichever version the base image's Debian has will do)
# hadolint ignore=DL3008
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends binutils >/dev/null \
    && site=/opt/venv/lib/python3.11/site-packages \
    && find "$site" -depth -type d -name tests -exec rm -rf {} + \
    && rm -rf "$site"/onnxruntime/capi/libonnxruntime.so* "$site"/onnxruntime/transformers \
        "$site"/onnxruntime/quantization "$site"/onnxruntime/tools \
    && find /opt/venv -name '*.so*' -type f -not -path '*.libs/*' -exec strip --strip-unneeded {} + \
    && pip uninstall --yes --quiet setuptools pip \
    && find /opt/venv -depth -type d -name __pycache__ -exec rm -rf {} +

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TWINWATCH_HOST=0.0.0.0 \
    TWINWATCH_PORT=8000 \
    TWINWATCH_DATA_DIR=/var/lib/twinwatch \
    # Your own models (mount them here), served beside the shipped ones.
    TWINWATCH_MODELS_DIR=/opt/twinwatch/models \
    TWINWATCH_MIGRATE_ON_START=false
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/twinwatch --create-home \
    --shell /usr/sbin/nologin twinwatch
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
WORKDIR /var/lib/twinwatch
# Numeric, so the runtime can check it is not root without reading /etc/passwd.
USER 10001:10001
VOLUME ["/var/lib/twinwatch"]
EXPOSE 8000
# No curl in a slim image: the standard library does the probe.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["serve"]
