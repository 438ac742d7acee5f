#!/usr/bin/env bash
# Start the services the tests need (PostgreSQL, MariaDB, NATS JetStream, RabbitMQ, Redis,
# Mosquitto, and moto as the Amazon SQS, SNS and Kinesis emulator)
# when they are not answering on loopback, installing them from Debian packages when they are
# missing.
# Safe to run again: it only acts on what is down.
set -euo pipefail

log() { echo "services: $*" >&2; }
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  local port=$1 name=$2 i
  for i in $(seq 1 90); do
    up "$port" && return 0
    sleep 1
  done
  log "$name did not start listening on 127.0.0.1:$port"
  return 1
}
apt_updated=
apt_install() {
  if [ "$(id -u)" != 0 ]; then log "need root to install $*"; return 1; fi
  if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# --- PostgreSQL ----------------------------------------------------------------------------
if ! up 5432; then
  if ! command -v pg_ctlcluster >/dev/null || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
    log "installing PostgreSQL"
    apt_install postgresql
    ver=$(ls /etc/postgresql | sort -V | tail -1)
    # Trust loopback connections, as the tests expect (a fresh install wants passwords).
    hba=/etc/postgresql/$ver/main/pg_hba.conf
    sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' "$hba"
  fi
  log "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start || true
  wait_port 5432 PostgreSQL
fi
for _ in $(seq 1 30); do
  psql -h 127.0.0.1 -U postgres -d postgres -Atc 'select 1' >/dev/null 2>&1 && break
  sleep 1
done
# The WAL source reads PostgreSQL's logical replication stream: wal_level = logical (a
# restart), and replication connections from loopback as trusted as the others.
pg_ver=$(ls /etc/postgresql | sort -V | tail -1)
hba=/etc/postgresql/$pg_ver/main/pg_hba.conf
if [ -w "$hba" ] && ! grep -Eq '^host\s+replication\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
  log "allowing replication connections from 127.0.0.1 ($hba)"
  sed -i -E '/^host\s+replication\s+all\s+127\.0\.0\.1\/32\s/d' "$hba"
  echo 'host replication all 127.0.0.1/32 trust' >> "$hba"
  psql -h 127.0.0.1 -U postgres -d postgres -qAtc 'select pg_reload_conf()' >/dev/null
fi
if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -Atc 'show wal_level')" != logical ]; then
  log "setting wal_level = logical and restarting PostgreSQL"
  psql -h 127.0.0.1 -U postgres -d postgres -qc 'ALTER SYSTEM SET wal_level = logical'
  pg_ctlcluster --skip-systemctl-redirect "$pg_ver" main restart
  wait_port 5432 PostgreSQL
  for _ in $(seq 1 30); do
    psql -h 127.0.0.1 -U postgres -d postgres -Atc 'select 1' >/dev/null 2>&1 && break
    sleep 1
  done
fi
if ! psql -h 127.0.0.1 -U postgres -d postgres -Atc "select 1 from pg_database where datname = 'test'" | grep -q 1; then
  psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test' || true
fi

# --- MariaDB (the MySQL store's tests) -------------------------------------------------------
if ! up 3306; then
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || { log "installing MariaDB"; apt_install mariadb-server; }
  log "starting MariaDB"
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
  if [ ! -d /var/lib/mysql/mysql ]; then
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  fi
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- \
    --user=mysql --bind-address=127.0.0.1 --port=3306
  wait_port 3306 MariaDB
fi
# root over TCP without a password, as the tests expect (a fresh install allows only the
# unix socket for root).
for _ in $(seq 1 30); do
  mariadb -h 127.0.0.1 -u root -e 'select 1' >/dev/null 2>&1 && break
  mariadb -u root -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket" >/dev/null 2>&1 || true
  sleep 1
done

# --- NATS with JetStream -------------------------------------------------------------------
if ! up 4222; then
  command -v nats-server >/dev/null || { log "installing nats-server"; apt_install nats-server; }
  log "starting NATS"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server)" -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_port 4222 NATS
fi

# --- RabbitMQ ------------------------------------------------------------------------------
if ! up 5672; then
  command -v rabbitmq-server >/dev/null || { log "installing RabbitMQ"; apt_install rabbitmq-server; }
  log "starting RabbitMQ"
  rabbitmq-server -detached || true
  wait_port 5672 RabbitMQ
fi
# --- Redis ---------------------------------------------------------------------------------
if ! up 6379; then
  command -v redis-server >/dev/null || { log "installing Redis"; apt_install redis-server; }
  log "starting Redis"
  mkdir -p /var/lib/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis
  wait_port 6379 Redis
fi

# --- Mosquitto (MQTT) -----------------------------------------------------------------------
if ! up 1883; then
  command -v mosquitto >/dev/null || { log "installing Mosquitto"; apt_install mosquitto; }
  log "starting Mosquitto"
  if [ -f /etc/mosquitto/mosquitto.conf ]; then
    mosquitto -d -c /etc/mosquitto/mosquitto.conf
  else
    mosquitto -d -p 1883
  fi
  wait_port 1883 Mosquitto
fi
# --- Amazon SQS, SNS and Kinesis: moto's server mode (from PyPI, in a virtualenv of its own) -
# The sqs://, sns:// and kinesis:// tests reach it at SQS_ENDPOINT=http://127.0.0.1:4566 with dummy
# credentials; moto keeps everything in memory.
moto_dir=/opt/txoutbox-moto
moto_version=5.2.5
if ! up 4566; then
  if ! "$moto_dir/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$moto_version')" 2>/dev/null; then
    log "installing moto $moto_version in $moto_dir"
    python3 -m venv "$moto_dir" 2>/dev/null || { apt_install python3-venv; python3 -m venv "$moto_dir"; }
    "$moto_dir/bin/pip" install -q --disable-pip-version-check "moto[server]==$moto_version"
  fi
  log "starting moto (SQS, SNS, Kinesis) on 127.0.0.1:4566 (log: /tmp/moto.log)"
  nohup "$moto_dir/bin/moto_server" -H 127.0.0.1 -p 4566 >/tmp/moto.log 2>&1 </dev/null &
  wait_port 4566 moto
fi
log "PostgreSQL, MariaDB, NATS, RabbitMQ, Redis, Mosquitto and moto are answering"
