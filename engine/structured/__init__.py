"""Constrained decoding: a request's output held to a grammar (JSON schema, regex, choice, EBNF, a structural
tag), compiled off the engine loop by xgrammar (grammar_compiler.py) and enforced by a token mask in the
sampler's first stage (step_masks.py). Modules import xgrammar where they need it: the engine's other users
(the simulator, the CLI's planning commands) never load it."""
