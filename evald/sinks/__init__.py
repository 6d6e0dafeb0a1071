"""Where results go: TensorBoard records, the control channel, the best-checkpoint pointer."""
