"""What all three trainers share that is neither math nor model loading: keeping a run safe and resumable. How it
works: docs/internals.md#runtime."""
