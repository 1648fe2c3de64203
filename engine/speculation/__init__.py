"""Speculative decoding: a drafter proposes the tokens a request is likely to emit next, the step loop
picks how many of them each request verifies (policies/draft_lengths.py prices them like any other
rows), and one step of k + 1 decode rows per request keeps the longest prefix the target model's own
samples agree with (verification.py), so outputs are those of decoding without speculation."""
