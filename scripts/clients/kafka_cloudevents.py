"""Read Kafka records with confluent-kafka and parse each with the CloudEvents SDK's Kafka
protocol binding (binary content mode). Prints one JSON object per record: the event's
attributes and its data. Exits non-zero if a record is not a valid CloudEvent.

usage: kafka_cloudevents.py BROKERS TOPIC COUNT
"""
import json
import sys
import time
import uuid

from cloudevents.core.bindings import kafka
from confluent_kafka import Consumer, TopicPartition


def main() -> int:
    brokers, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    consumer = Consumer({
        "bootstrap.servers": brokers,
        "group.id": f"txotest-ce-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    meta = consumer.list_topics(topic, timeout=10)
    partitions = meta.topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    deadline = time.monotonic() + 30
    seen = 0
    while seen < count:
        if time.monotonic() > deadline:
            print(f"only {seen} of {count} records within 30 s", file=sys.stderr)
            return 1
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            print(f"consume: {msg.error()}", file=sys.stderr)
            return 1
        headers = {k: v for k, v in (msg.headers() or [])}
        event = kafka.from_binary_event(
            kafka.KafkaMessage(headers=headers, key=msg.key(), value=msg.value())
        )
        attrs = {k: (v.isoformat() if hasattr(v, "isoformat") else v)
                 for k, v in event.get_attributes().items()}
        print(json.dumps({"attributes": attrs, "data": event.get_data(),
                          "key": msg.key().decode() if msg.key() else None}))
        seen += 1
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
