# The image the Helm chart runs: `wasmsched` (scheduler) and `wasmsched-agent` (node agent).
#   docker build -t ghcr.io/wasmsched/wasmsched:0.1.0 .
# The agent loads NVML (libnvidia-ml.so) from the host driver at run time, mounted by the NVIDIA
# container toolkit (the chart's runtimeClassName: nvidia); nothing GPU-specific is built in.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN rustup target add wasm32-wasip2 \
 && cargo build --release --locked -p wasmsched-cli -p wasmsched-agent \
 && cp target/release/wasmsched target/release/wasmsched-agent /usr/local/bin/

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/wasmsched /usr/local/bin/wasmsched-agent /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["wasmsched"]
