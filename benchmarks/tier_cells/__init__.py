"""The T* validation table: f16 resident, f16 + spill, q8_0 resident and the automatic choice, and the
design's four PASS checks per cell."""
