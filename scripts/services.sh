#!/usr/bin/env bash
# Makes sure the services the test suite talks to answer on loopback:
# PostgreSQL (5432), RabbitMQ (5672), NATS with JetStream (4222), a
# Kafka-compatible broker (9092), an SQS- and DynamoDB-compatible server (5000) and Redis
# (6379), and a Redis Cluster of three primaries on 7001-7003, made with
# redis-cli --cluster create from the same redis-server binary, its nodes'
# files in the cache (IDEM_CACHE, below). The Redis tests also start private
# redis-server processes of their own (a server they restart, a cluster with
# replicas whose primary they kill).
# A service that does not answer is started; one that is not installed is
# installed from Debian's packages first. No Apache Kafka build comes from
# Debian's packages, so the Kafka protocol is served by tansu, a
# Kafka-compatible broker from crates.io, built once into a cache outside the
# repository (IDEM_CACHE, default ~/.cache/idem) and started on SQLite
# storage in /var/lib/idem-kafka, which keeps records and committed offsets
# across its own restarts. No Amazon endpoint is reachable from the test
# machines, so SQS and DynamoDB are served by moto's server, installed from
# PyPI into a virtual environment in the same cache and started on
# 127.0.0.1:5000; it must answer an SQS and a DynamoDB request, not only accept
# connections. The gateway's gRPC tests
# call it from another language: grpcio from PyPI, in its own virtual
# environment in the cache. etcd (Debian's etcd-server) runs on
# 127.0.0.1:2379 with its data in /var/lib/idem-etcd, and protoc (Debian's
# protobuf-compiler) is installed for the build of the etcd client, which
# compiles etcd's protobuf files. The PgBouncer tests start private pgbouncer
# processes of their own (idem-testkit's pgbouncer module), so Debian's
# pgbouncer package is installed, not started. Exits non-zero, naming the service, if one
# still does not answer.
set -uo pipefail
# This script's folder: the helpers beside it (moto_server.py).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { printf '[services] %s\n' "$*" >&2; }

answers() { # host port
  timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

wait_for() { # name port seconds
  local name=$1 port=$2 limit=$3 waited=0
  until answers 127.0.0.1 "$port"; do
    if [ "$waited" -ge "$limit" ]; then
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  log "$name answers on 127.0.0.1:$port"
}

apt_updated=0
install_packages() {
  if [ "$apt_updated" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || return 1
    apt_updated=1
  fi
  log "installing $* from Debian's packages"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

start_postgres() {
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    install_packages postgresql || return 1
    local conf
    conf=$(ls -d /etc/postgresql/*/main | head -n 1)
    # Local tests connect as postgres over TCP without a password, as on the
    # development machines.
    printf 'host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n' \
      | cat - "$conf/pg_hba.conf" > "$conf/pg_hba.conf.new" && mv "$conf/pg_hba.conf.new" "$conf/pg_hba.conf"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start >&2
}

start_rabbitmq() {
  command -v rabbitmq-server >/dev/null || install_packages rabbitmq-server || return 1
  rabbitmq-server -detached >&2
}

start_nats() {
  command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || install_packages nats-server || return 1
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log >&2
}

start_redis() {
  { command -v redis-server >/dev/null && command -v redis-cli >/dev/null; } \
    || install_packages redis-server || return 1
  mkdir -p /var/lib/idem-redis
  redis-server --port 6379 --bind 127.0.0.1 --daemonize yes --dir /var/lib/idem-redis \
    --logfile /var/lib/idem-redis/redis.log >&2
}

REDIS_CLUSTER_PORTS=(7001 7002 7003)

cluster_ok() {
  redis-cli -h 127.0.0.1 -p "${REDIS_CLUSTER_PORTS[0]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'
}

# Starts the cluster's nodes where they do not answer; joins them into a
# cluster when they are not one yet (a node that already knows the others
# reads them back from its nodes.conf).
start_redis_cluster() {
  local dir="$cache/redis-cluster" port nodes=()
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    nodes+=("127.0.0.1:$port")
    answers 127.0.0.1 "$port" && continue
    mkdir -p "$dir/$port"
    redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --dir "$dir/$port" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --appendonly yes --save '' --logfile "$dir/$port/redis.log" >&2 || return 1
  done
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    wait_for "Redis Cluster node" "$port" 20 || return 1
  done
  for _ in $(seq 1 50); do
    cluster_ok && return 0
    # Several nodes each knowing only itself: not joined yet.
    if redis-cli -h 127.0.0.1 -p "${REDIS_CLUSTER_PORTS[0]}" cluster info 2>/dev/null | grep -q 'cluster_known_nodes:1'; then
      for port in "${REDIS_CLUSTER_PORTS[@]}"; do
        redis-cli -h 127.0.0.1 -p "$port" flushall >/dev/null 2>&1
        redis-cli -h 127.0.0.1 -p "$port" cluster reset hard >/dev/null 2>&1
      done
      log "creating the Redis Cluster on ${nodes[*]}"
      redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >&2 || return 1
    fi
    sleep 0.2
  done
  cluster_ok
}

# A port that accepts connections is not enough: Redis must answer PING.
redis_answers() {
  [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]
}

cache="${IDEM_CACHE:-$HOME/.cache/idem}"
tansu="$cache/tansu/bin/tansu"
TANSU_VERSION=0.6.0

start_kafka() {
  if ! [ -x "$tansu" ]; then
    log "building tansu $TANSU_VERSION (a Kafka-compatible broker) into $cache/tansu; this takes a while once"
    # Optimised at level 1, not 3: the broker serves the tests' few thousand
    # records as fast either way (the Kafka tests took 91 s on it, 93 s on a
    # level-3 build), and it builds in about 8 minutes on two cores, about
    # half of what the default level takes.
    CARGO_PROFILE_RELEASE_OPT_LEVEL=1 \
      cargo install --locked "tansu@$TANSU_VERSION" --features dynostore,libsql --root "$cache/tansu" >&2 || return 1
  fi
  local data=/var/lib/idem-kafka
  mkdir -p "$data"
  # Tests make topics of their own and keep them (see the Kafka test helper);
  # nothing reads them after the run, and the broker slows as its file grows.
  if [ -f "$data/tansu.db" ] && [ "$(du -m "$data/tansu.db" | cut -f1)" -gt 200 ]; then
    log "the Kafka broker's file holds over 200 MB of old test topics; starting on a new one"
    rm -f "$data"/tansu.db*
  fi
  (cd "$data" && nohup "$tansu" broker \
    --listener-url tcp://127.0.0.1:9092 \
    --advertised-listener-url tcp://127.0.0.1:9092 \
    --storage-engine sqlite://tansu.db >>"$data/tansu.log" 2>&1 &)
}

# A tansu whose storage task panicked still answers on its port but serves
# nothing: restart it (its SQLite file keeps the records and offsets).
restart_kafka_if_broken() {
  local log=/var/lib/idem-kafka/tansu.log
  if [ -f "$log" ] && grep -q "panicked" "$log"; then
    log "the Kafka broker's storage failed earlier (see $log.failed); restarting it"
    pkill -f "$tansu broker" || true
    sleep 1
    mv "$log" "$log.failed"
  fi
}

moto="$cache/moto"
MOTO_VERSION=5.2.5
MOTO_PORT=5000

start_moto() {
  # The dynamodb extra brings the PartiQL parser moto's DynamoDB imports.
  if ! [ -x "$moto/bin/moto_server" ] || ! "$moto/bin/python" -c 'import py_partiql_parser' 2>/dev/null; then
    log "installing moto[server,dynamodb] $MOTO_VERSION (an SQS- and DynamoDB-compatible server) from PyPI into $moto"
    command -v python3 >/dev/null || install_packages python3 python3-venv || return 1
    python3 -m venv "$moto" >&2 || { install_packages python3-venv && python3 -m venv "$moto" >&2; } || return 1
    "$moto/bin/pip" install --quiet "moto[server,dynamodb]==$MOTO_VERSION" >&2 || return 1
  fi
  local data=/var/lib/idem-moto
  mkdir -p "$data"
  # moto's server through scripts/moto_server.py, which makes DynamoDB's
  # conditional writes atomic, as DynamoDB's are (see the file).
  (cd "$data" && nohup "$moto/bin/python" "$here/moto_server.py" -H 127.0.0.1 -p "$MOTO_PORT" >>"$data/moto.log" 2>&1 &)
}

# A port that accepts connections is not enough: the server on it must answer
# SQS's JSON protocol (ListQueues), as the tests' SDK speaks it.
sqs_answers() {
  command -v curl >/dev/null || install_packages curl || return 1
  curl -sf --max-time 5 -X POST "http://127.0.0.1:$MOTO_PORT/" \
    -H 'Content-Type: application/x-amz-json-1.0' \
    -H 'X-Amz-Target: AmazonSQS.ListQueues' \
    -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0' \
    -d '{}' >/dev/null
}

# The same server must answer DynamoDB's JSON protocol too (ListTables), for
# the DynamoDB store's tests.
dynamodb_answers() {
  curl -sf --max-time 5 -X POST "http://127.0.0.1:$MOTO_PORT/" \
    -H 'Content-Type: application/x-amz-json-1.0' \
    -H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
    -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0' \
    -d '{}' >/dev/null
}

start_etcd() {
  command -v etcd >/dev/null || install_packages etcd-server || return 1
  local data=/var/lib/idem-etcd
  mkdir -p "$data"
  (nohup etcd --name idem --data-dir "$data/member" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster idem=http://127.0.0.1:2380 >>"$data/etcd.log" 2>&1 &)
}

grpcio="$cache/grpcio"
GRPCIO_VERSION=1.85.3

# Python's gRPC client, which the gateway's tests call it with.
ensure_grpcio() {
  if "$grpcio/bin/python" -c 'import grpc' 2>/dev/null; then
    log "grpcio is ready in $grpcio"
    return 0
  fi
  log "installing grpcio $GRPCIO_VERSION (Python's gRPC client) from PyPI into $grpcio"
  command -v python3 >/dev/null || install_packages python3 python3-venv || return 1
  python3 -m venv "$grpcio" >&2 || { install_packages python3-venv && python3 -m venv "$grpcio" >&2; } || return 1
  "$grpcio/bin/pip" install --quiet "grpcio==$GRPCIO_VERSION" >&2 || return 1
  "$grpcio/bin/python" -c 'import grpc' 2>/dev/null
}

ensure() { # name port start-function seconds
  local name=$1 port=$2 start=$3 limit=$4
  if answers 127.0.0.1 "$port"; then
    log "$name answers on 127.0.0.1:$port"
    return 0
  fi
  log "$name does not answer on 127.0.0.1:$port; starting it"
  "$start" || log "starting $name failed"
  if ! wait_for "$name" "$port" "$limit"; then
    log "ERROR: $name still does not answer on 127.0.0.1:$port after ${limit}s"
    return 1
  fi
}

failed=0
ensure PostgreSQL 5432 start_postgres 60 || failed=1
ensure RabbitMQ 5672 start_rabbitmq 90 || failed=1
ensure NATS 4222 start_nats 30 || failed=1
restart_kafka_if_broken
ensure Kafka 9092 start_kafka 60 || failed=1
if ensure "SQS (moto)" "$MOTO_PORT" start_moto 120; then
  if ! sqs_answers; then
    log "ERROR: something answers on 127.0.0.1:$MOTO_PORT but not SQS's ListQueues; stop it or free the port for moto's server"
    failed=1
  elif ! dynamodb_answers; then
    log "ERROR: moto answers SQS on 127.0.0.1:$MOTO_PORT but not DynamoDB's ListTables; reinstall it with the dynamodb extra (delete $moto and run this script again)"
    failed=1
  fi
else
  failed=1
fi

ensure etcd 2379 start_etcd 60 || failed=1
if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ] && ! install_packages pgbouncer; then
  log "ERROR: pgbouncer is missing and Debian's pgbouncer package could not be installed; the PostgreSQL tests through a transaction pooler need it"
  failed=1
fi
if ! command -v protoc >/dev/null && ! install_packages protobuf-compiler; then
  log "ERROR: protoc is missing and Debian's protobuf-compiler could not be installed; the etcd client's build needs it"
  failed=1
fi

if ensure Redis 6379 start_redis 30; then
  if ! command -v redis-cli >/dev/null && ! install_packages redis-server; then
    log "ERROR: Redis answers but redis-cli (Debian's redis-tools) is missing and could not be installed; the Redis Cluster tests need it"
    failed=1
  elif ! redis_answers; then
    log "ERROR: something answers on 127.0.0.1:6379 but not Redis's PING; stop it or free the port for redis-server"
    failed=1
  fi
else
  failed=1
fi

if cluster_ok; then
  log "Redis Cluster answers on 127.0.0.1 ports ${REDIS_CLUSTER_PORTS[*]}"
elif ! start_redis_cluster; then
  log "ERROR: the Redis Cluster on 127.0.0.1 ports ${REDIS_CLUSTER_PORTS[*]} is not in cluster_state:ok; see $cache/redis-cluster/*/redis.log, or delete that directory to start it anew"
  failed=1
fi

if ! ensure_grpcio; then
  log "ERROR: could not install grpcio into $grpcio; the gateway's gRPC tests need it"
  failed=1
fi

if [ "$failed" = 0 ] && command -v psql >/dev/null; then
  if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc 'SELECT 1' >/dev/null 2>&1; then
    log "ERROR: PostgreSQL answers but 'psql -h 127.0.0.1 -U postgres' cannot log in without a password"
    failed=1
  fi
fi

if [ "$failed" != 0 ]; then
  log "ERROR: required services are missing; the service-backed tests cannot run"
  exit 1
fi
