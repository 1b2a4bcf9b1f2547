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
# nvidia-mig-parted beside it: invoked by that name, gpupart answers mig-parted's command line.
RUN cargo build --release --locked -p gpupart --bin gpupart \
    && mkdir -p /out && cp target/release/gpupart /out/gpupart && ln -s gpupart /out/nvidia-mig-parted

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
