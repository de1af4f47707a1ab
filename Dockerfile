# actstore server image: the gRPC server, Ray, torch (CPU) and the offline models and data sets.
# One install path: scripts/setup.sh, the same script a developer machine and CI run.
#
#   docker build -t actstore .
#   docker build --build-arg TORCH_INDEX_URL=<PyTorch's CPU-only wheel index> -t actstore .
#
# TORCH_INDEX_URL: where to get torch==2.13.0. Empty (the default) takes it from the ordinary
# package index, whose Linux build brings several GB of CUDA packages; PyTorch's CPU-only wheel
# index (see PyTorch's install page) gives a much smaller image on machines without a GPU.
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX_URL=""
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    ACTSTORE_DATA_DIR=/opt/actstore-data

WORKDIR /app

# Dependencies and data first, from the files that name them only, so that a change to the
# source reuses this layer.
COPY pyproject.toml constraints.txt ./
COPY scripts/setup.sh scripts/setup.sh
RUN TORCH_INDEX_URL="$TORCH_INDEX_URL" bash scripts/setup.sh --deps-only \
    && rm -rf /var/lib/apt/lists/*

# The project itself (an editable install of /app; everything else is already there).
COPY . .
RUN bash scripts/setup.sh && rm -rf /var/lib/apt/lists/*

ENV ACTSTORE_STORE=/data \
    ACTSTORE_HOST=0.0.0.0
VOLUME ["/data"]
EXPOSE 50151
CMD ["actstore", "serve"]
