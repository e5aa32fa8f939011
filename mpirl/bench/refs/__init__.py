"""Scripts the benchmarks run in the reference libraries' own venvs (:mod:`mpirl.bench.reference_venv`); they import
nothing of mpirl."""
