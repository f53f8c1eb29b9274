"""Stage 3, publish: the staged night checked against its invariants and swapped in whole,
under the output lock, with a journal that a crash rolls forward."""
