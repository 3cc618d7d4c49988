"""The trainer: the loop, its settings, growth inside a run, data, FSDP and the Trainer callback."""
