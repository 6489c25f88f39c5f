"""Prices: clusters and the device catalog, the DeviceProfile format, the per-op strategy space
(meshes, configurations, where placements may change, pipeline schedules) and the cost model."""
