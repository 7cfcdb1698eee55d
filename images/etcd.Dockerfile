# etcd for virt-apiserver (Debian's etcd-server, as `cargo xtask images` uses):
# `docker build -f images/etcd.Dockerfile -t localhost/kubevirt-rs/etcd:latest images/`
FROM docker.io/library/debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends etcd-server \
    && rm -rf /var/lib/apt/lists/*
USER 65532:65532
ENTRYPOINT ["/usr/bin/etcd"]
