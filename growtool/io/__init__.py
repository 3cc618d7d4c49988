"""Checkpoint input and output: safetensors, folders, nanoGPT, remote-code folders, model cards."""
