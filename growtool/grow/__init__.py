"""Growth: the plan, the tensor operators, the recipes and the optimizer-state growth."""
