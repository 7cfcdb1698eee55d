# virt-controller for users with Docker (and kind): `docker build -f images/virt-controller.Dockerfile -t localhost/kubevirt-rs/virt-controller:latest .`
# from the workspace root. Not built by this project's CI (no Docker here): `cargo xtask images`
# builds the equivalent FROM-scratch image with buildah. See docs/deploy.md.
FROM docker.io/library/rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p virt-controllers --bin virt-controller

FROM docker.io/library/debian:bookworm-slim
# Only the binary: it links glibc (and libgcc_s) from the base image, nothing else.
COPY --from=build /src/target/release/virt-controller /usr/bin/virt-controller
USER 65532:65532
ENTRYPOINT ["/usr/bin/virt-controller"]
