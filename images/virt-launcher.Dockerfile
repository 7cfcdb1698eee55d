# virt-launcher for users with Docker (and kind): the only image with libvirt and QEMU.
# `docker build -f images/virt-launcher.Dockerfile -t localhost/kubevirt-rs/virt-launcher:latest .`
# from the workspace root. Not built here (no Docker): `cargo xtask images` assembles the same
# userland from this machine's Debian packages with buildah. See docs/deploy.md.
FROM docker.io/library/rust:1-slim-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libvirt-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p virt-launcher --bin virt-launcher

FROM docker.io/library/debian:bookworm-slim
# libvirtd with the QEMU driver, QEMU (x86 system emulator, TCG when KVM is absent) and its
# firmware, qemu-img for disk overlays, xorriso for cloud-init ISOs, busybox for the pod's
# helpers.
RUN apt-get update && apt-get install -y --no-install-recommends \
        libvirt-daemon-driver-qemu libvirt-daemon libvirt-clients qemu-system-x86 \
        qemu-utils ovmf xorriso util-linux busybox-static ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/virt-launcher /usr/bin/virt-launcher
ENTRYPOINT ["/usr/bin/virt-launcher"]
