"""Parses a metrics exposition with the official Python Prometheus client's parsers.

Usage: parse_metrics.py (prometheus|openmetrics) FILE
Prints one JSON array: every sample as {"family", "type", "name", "labels", "value"}.
A parse error is an exception (exit status 1), which fails the check that ran it.
"""

import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as prometheus_families


def main() -> int:
    fmt, path = sys.argv[1], sys.argv[2]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    parse = openmetrics_families if fmt == "openmetrics" else prometheus_families
    out = []
    for family in parse(text):
        for sample in family.samples:
            out.append({"family": family.name, "type": family.type, "name": sample.name,
                        "labels": dict(sample.labels), "value": sample.value})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
