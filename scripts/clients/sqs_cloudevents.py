"""Read SQS messages with boto3 and parse each as a CloudEvent with the CloudEvents SDK: the
`ce-*` and `content-type` message attributes are the HTTP binding's binary-mode headers (SQS
has no binding of its own; txoutbox names its attributes after HTTP's). Prints one JSON object
per message: the event's attributes, its data, the message attributes, and the FIFO group and
dedup ids. Exits non-zero if a message is not a valid CloudEvent. Deletes what it read.

usage: sqs_cloudevents.py ENDPOINT QUEUE_URL COUNT
(credentials and region from the environment, as for any boto3 client)
"""
import json
import sys
import time

import boto3
from cloudevents.core.bindings import http


def main() -> int:
    endpoint, queue_url, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sqs = boto3.client("sqs", endpoint_url=endpoint)
    deadline = time.monotonic() + 30
    seen = 0
    while seen < count:
        if time.monotonic() > deadline:
            print(f"only {seen} of {count} messages within 30 s", file=sys.stderr)
            return 1
        out = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        )
        for m in out.get("Messages", []):
            attributes = {k: v["StringValue"] for k, v in m.get("MessageAttributes", {}).items()}
            event = http.from_binary_event(
                http.HTTPMessage(headers=attributes, body=m["Body"].encode())
            )
            ce = {k: (v.isoformat() if hasattr(v, "isoformat") else v)
                  for k, v in event.get_attributes().items()}
            system = m.get("Attributes", {})
            print(json.dumps({
                "attributes": ce,
                "data": event.get_data(),
                "message_attributes": attributes,
                "group_id": system.get("MessageGroupId"),
                "dedup_id": system.get("MessageDeduplicationId"),
            }))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
            seen += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
