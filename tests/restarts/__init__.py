"""A standing cluster's head restarted (its own Ray clusters: kept out of tests/faults, whose
package-wide cluster a driver's ray.init elsewhere would end)."""
