# syntax=docker/dockerfile:1
#
# One image with the three Harvest binaries: gateway, worker and harvest
# (the operator CLI). Built static (no cgo) and copied onto a distroless
# base that holds nothing else: no shell, no package manager. Containers
# pick the binary with their command, e.g. ["gateway"].
#
#   docker build -t harvest:local .

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/ \
      ./cmd/gateway ./cmd/worker ./cmd/harvest

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gateway /out/worker /out/harvest /usr/local/bin/
USER nonroot:nonroot
# The gateway's HTTP port and the worker's metrics port.
EXPOSE 8080 9464
CMD ["harvest", "--help"]
