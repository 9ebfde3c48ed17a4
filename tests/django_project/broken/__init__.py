"""An app whose tasks module exits at import; installed only by the test that needs it."""
