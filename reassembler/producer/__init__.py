"""The producer side of the contract: writing capture as a trainer's harness does
(capture.py) and whole synthetic nights with faults and expected outcomes (synth.py).

The nightly job never imports this package; `reassembler synth`, the tests and the
benchmark do. It is kept apart so that the reader is never checked only against itself:
the digests are pinned by NeMo Gym's published vectors, and NeMo Gym's own fixture night.
"""
