"""Field sources: each turns readings from a device or broker into `Sample`s."""
