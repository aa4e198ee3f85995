#!/usr/bin/env bash
# Make sure Redis, PostgreSQL and RabbitMQ answer on loopback before the tests: start them when
# they are installed and not running, say clearly what is missing otherwise.
set -u
missing=0

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; }
pg_up() { pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; }
# the AMQP port answers (the RabbitMQ tests talk AMQP 0-9-1 to it, guest/guest)
rabbit_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) >/dev/null 2>&1; }

if ! redis_up; then
  if command -v redis-server >/dev/null; then
    echo "services: starting Redis on 127.0.0.1:6379"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir /tmp --logfile /tmp/cc-redis.log
    for _ in $(seq 1 50); do redis_up && break; sleep 0.2; done
  fi
  redis_up || { echo "services: Redis is not reachable on 127.0.0.1:6379 and redis-server is not installed (apt-get install redis-server)"; missing=1; }
fi

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql >/dev/null 2>&1; then
    echo "services: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    for _ in $(seq 1 50); do pg_up && break; sleep 0.2; done
  fi
  pg_up || { echo "services: PostgreSQL is not reachable on 127.0.0.1:5432 and no local cluster could be started (apt-get install postgresql)"; missing=1; }
fi

if ! rabbit_up; then
  if [ -x /etc/init.d/rabbitmq-server ]; then
    echo "services: starting RabbitMQ"
    /etc/init.d/rabbitmq-server start >/dev/null 2>&1 || true
  elif command -v rabbitmq-server >/dev/null; then
    echo "services: starting RabbitMQ"
    rabbitmq-server -detached >/dev/null 2>&1 || true
  fi
  for _ in $(seq 1 150); do rabbit_up && break; sleep 0.2; done
  rabbit_up || { echo "services: RabbitMQ is not reachable on 127.0.0.1:5672 and could not be started (apt-get install rabbitmq-server)"; missing=1; }
fi

if [ "$missing" = 1 ]; then
  echo "services: the integration tests need the services above" >&2
  exit 1
fi
echo "services: Redis, PostgreSQL and RabbitMQ answer"
