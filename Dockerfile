# twinwatch: the service (default command) or the built-in twin (`twin ...`), one image.
# Two stages: the build stage installs the plain package (no torch: serving runs the models'
# ONNX graphs) into a venv; the runtime stage copies the venv, nothing else (no source tree, no
# compilers, no pip cache). The migrations and the shipped models are inside the package.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies before the code, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
COPY app/__init__.py app/py.typed app/
RUN pip install . && pip uninstall --yes twinwatch
COPY app app
RUN pip install --no-deps .

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
