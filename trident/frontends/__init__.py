"""Front doors, the floor above the pipeline: `trident.compile` (compile.py) and
`torch.compile(..., backend="trident")` (dynamo.py) turn a user's program into captures that
the pipeline below (capture -> passes -> scm -> lowering -> runtime) optimizes; the state of
objects a program is passed (state.py) and inspection (explain, cache_info) live here too."""
