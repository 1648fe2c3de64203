"""Step-time models and the simulator they drive: calibrated cost models of this machine, GPU
hardware profiles, the live correction the scheduler prices steps with, and discrete-event runs of
the real scheduler against them."""
