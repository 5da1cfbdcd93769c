# mini-broker: one broker process, data on a volume, metrics on :9404.
#   docker build -t mini-broker . && docker run -p 9092:9092 -p 9404:9404 mini-broker
# or the whole stack with Prometheus and Grafana: docker compose up --build (docs/observability.md)
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system --gid 10001 broker \
 && useradd --system --uid 10001 --gid broker --home-dir /var/lib/mini-broker \
      --shell /usr/sbin/nologin broker \
 && mkdir -p /var/lib/mini-broker/data \
 && chown -R broker:broker /var/lib/mini-broker

WORKDIR /opt/mini-broker
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY purgatory ./purgatory
COPY broker ./broker
COPY config ./config
# EXTRAS="[cluster]" adds the etcd client for cluster mode (docker-compose.yml's cluster profile).
ARG EXTRAS=""
RUN pip install ".${EXTRAS}" && rm -rf build ./*.egg-info

USER broker
VOLUME ["/var/lib/mini-broker/data"]
EXPOSE 9092 9404

# Healthy = answers an ApiVersions request, as a client's first request would be.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-m", "broker.healthcheck", "127.0.0.1:9092"]

# advertised.listeners is what clients are told to connect to: localhost:9092 suits clients on
# the host (port published) and containers sharing the broker's network namespace; override it
# (docker run ... --override advertised.listeners=PLAINTEXT://host:9092) for anything else.
ENTRYPOINT ["mini-broker"]
CMD ["/opt/mini-broker/config/server.properties", \
     "--override", "listeners=PLAINTEXT://0.0.0.0:9092", \
     "--override", "advertised.listeners=PLAINTEXT://localhost:9092", \
     "--override", "log.dirs=/var/lib/mini-broker/data", \
     "--override", "metrics.listener=http://0.0.0.0:9404/metrics"]
