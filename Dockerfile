# twinwatch: the service (default command) or the built-in twin (`twin ...`), one image.
# Two stages: the build stage installs PyTorch's CPU wheel and the project into a venv; the
# runtime stage copies the venv and the source tree, nothing else (no compilers, no pip cache).

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# torch first, exactly, from PyTorch's CPU index: the default index would pull the CUDA build
# (gigabytes this service never uses).
RUN python -m venv /opt/venv \
    && pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
WORKDIR /opt/twinwatch
# Dependencies before the code, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
COPY app/__init__.py app/py.typed app/
RUN pip install . && pip uninstall --yes twinwatch
COPY app app
COPY migrations migrations
COPY alembic.ini ./
# Editable: app.storage.migrations finds alembic.ini and migrations/ beside the source tree.
RUN pip install --no-deps --editable .

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TWINWATCH_HOST=0.0.0.0 \
    TWINWATCH_PORT=8000 \
    TWINWATCH_DATA_DIR=/var/lib/twinwatch \
    TWINWATCH_MODELS_DIR=/opt/twinwatch/models \
    TWINWATCH_MIGRATE_ON_START=false
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/twinwatch --create-home \
    --shell /usr/sbin/nologin twinwatch
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/twinwatch /opt/twinwatch
COPY models /opt/twinwatch/models
COPY deploy/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
WORKDIR /opt/twinwatch
# Numeric, so the runtime can check it is not root without reading /etc/passwd.
USER 10001:10001
VOLUME ["/var/lib/twinwatch"]
EXPOSE 8000
# No curl in a slim image: the standard library does the probe.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["serve"]
