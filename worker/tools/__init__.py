"""The tools around the serving package: benchmark, fit and cost planners, quantization,
model download for image baking. The serving package never imports them."""
