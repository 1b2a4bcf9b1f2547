# gpupart node agent image.
# Build:  docker build -t ghcr.io/gpupart/gpupart:0.1.0 .
# (the image name the manifests use; tests/image.rs keeps every reference equal to it)
# The NVIDIA container toolkit injects libnvidia-ml.so.1 and nvidia-smi at run time
# (NVIDIA_DRIVER_CAPABILITIES=utility); the image carries neither.

FROM rust:1.89-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml build.rs ./
COPY proto proto
COPY crates crates
COPY src src
COPY benches benches
# `gpupart --version` names this commit: --build-arg GPUPART_COMMIT=$(git rev-parse --short=12 HEAD)
ARG GPUPART_COMMIT=unknown
# Linked against glibc 2.28 with zig (from PyPI), stripped: NVIDIA's MIG manager copies
# nvidia-mig-parted to the host and runs it there, on RHEL 8 (glibc 2.28) as on newer hosts.
# nvidia-mig-parted beside it: invoked by that name, gpupart answers mig-parted's command line.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-pip=23.0.1+dfsg-1 \
    && rm -rf /var/lib/apt/lists/* \
    && pip3 install --no-cache-dir --break-system-packages ziglang==0.17.1 cargo-zigbuild==0.24.1
COPY scripts/release scripts/release
RUN scripts/release \
    && mkdir -p /out && cp "target/$(uname -m)-unknown-linux-gnu/release/gpupart" /out/gpupart \
    && ln -s gpupart /out/nvidia-mig-parted

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
EXPOSE 9477
# Creating and destroying MIG instances needs root (CAP_SYS_ADMIN on the GPU device nodes); the
# DaemonSet runs the container privileged as user 0. `status` and `export` work as nonroot.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpupart"]
CMD ["agent", "--config-file", "/etc/gpupart/config.yaml"]
