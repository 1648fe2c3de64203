"""Load generation: workloads and prompts, the benchmark client for any OpenAI server, its plots,
and the capacity search (the largest request rate that meets the SLO)."""
