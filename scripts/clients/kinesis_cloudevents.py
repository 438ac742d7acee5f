"""Read a Kinesis stream's records with boto3 and parse each as a CloudEvent with the
CloudEvents SDK's JSON format (txoutbox writes `cloudevents=true` records in structured
content mode: CloudEvents has no Kinesis binding, and a record has no headers). Prints one JSON
object per record: the event's attributes, its data, the partition key and the shard. Exits
non-zero if a record is not a valid CloudEvent.

usage: kinesis_cloudevents.py ENDPOINT STREAM COUNT
(credentials and region from the environment, as for any boto3 client)
"""
import json
import sys
import time

import boto3
from cloudevents.core.formats.json import JSONFormat


def main() -> int:
    endpoint, stream, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kinesis = boto3.client("kinesis", endpoint_url=endpoint)
    shards = [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]]
    iterators = {
        shard: kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for shard in shards
    }
    deadline = time.monotonic() + 30
    seen = 0
    while seen < count:
        if time.monotonic() > deadline:
            print(f"only {seen} of {count} records within 30 s", file=sys.stderr)
            return 1
        for shard, iterator in list(iterators.items()):
            out = kinesis.get_records(ShardIterator=iterator, Limit=100)
            iterators[shard] = out["NextShardIterator"]
            for r in out["Records"]:
                event = JSONFormat().read(None, r["Data"])
                ce = {k: (v.isoformat() if hasattr(v, "isoformat") else v)
                      for k, v in event.get_attributes().items()}
                print(json.dumps({
                    "attributes": ce,
                    "data": event.get_data(),
                    "partition_key": r["PartitionKey"],
                    "shard": shard,
                }))
                seen += 1
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
