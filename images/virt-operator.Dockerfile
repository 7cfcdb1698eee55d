# virt-operator for users with Docker (and kind): `docker build -f images/virt-operator.Dockerfile -t localhost/kubevirt-rs/virt-operator:latest .`
# from the workspace root. Not built by this project's CI (no Docker here): `cargo xtask images`
# builds the equivalent FROM-scratch image with buildah. See docs/deploy.md.

# KubeVirt's common-instancetypes bundle, which virt-operator deploys, is KubeVirt's own
# release data: the kubevirt.io/kubevirt Go module pinned in e2e/virtctl/go.mod, checked
# against its go.sum (controllers/common-instancetypes/build.rs).
FROM docker.io/library/golang:1.24-bookworm AS kubevirt-module
WORKDIR /src/e2e/virtctl
COPY e2e/virtctl/go.mod e2e/virtctl/go.sum ./
RUN GOFLAGS=-mod=mod go mod download -json kubevirt.io/kubevirt \
    && cp -r "$(go list -m -f '{{.Dir}}' kubevirt.io/kubevirt)" /kubevirt-module
# KubeVirt's recording rules and alerts are Go code: KubeVirt's own code builds the
# PrometheusRule (controllers/operator/build.rs, promrules/), here where Go is.
WORKDIR /src/controllers/operator/promrules
COPY controllers/operator/promrules/ ./
RUN go run . kubevirt > /prometheus-kubevirt-rules.json

FROM docker.io/library/rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
COPY --from=kubevirt-module /kubevirt-module /kubevirt-module
ENV KUBEVIRT_RS_KUBEVIRT_MODULE_DIR=/kubevirt-module
COPY --from=kubevirt-module /prometheus-kubevirt-rules.json /prometheus-kubevirt-rules.json
ENV KUBEVIRT_RS_PROMETHEUS_RULE=/prometheus-kubevirt-rules.json
RUN cargo build --release --locked -p virt-operator --bin virt-operator

FROM docker.io/library/debian:bookworm-slim
# Only the binary: it links glibc (and libgcc_s) from the base image, nothing else.
COPY --from=build /src/target/release/virt-operator /usr/bin/virt-operator
USER 65532:65532
ENTRYPOINT ["/usr/bin/virt-operator"]
