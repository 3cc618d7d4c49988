"""Growth: the plan (``plan.py``), its steps (``steps.py``), their execution (``engine.py``), the
fold of the gates (``fold.py``), depth (``depth.py``), the tensor operators (``ops.py``), the
recipes and the optimizer-state growth (``moments.py``)."""
