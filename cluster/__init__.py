"""Replicas of the daemon on Ray Serve behind one OpenAI API, routed by load and prefix affinity
(docs/cluster.md). Only replica.py, ingress.py and app.py import Ray; the router is pure."""
