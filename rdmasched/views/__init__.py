"""The views: what shows a person the telemetry (docs/TELEMETRY.md).

`mirror` (a web page of the cluster's live state and its decisions, with its static files in
``mirror_static/``), `top` (the same in a terminal) and `live` (the reader that polls running
daemons' `/events`). They read what rdmasched.telemetry writes and serves (trace records,
Perfetto export, the metrics server); nothing below the command line imports them.
"""
