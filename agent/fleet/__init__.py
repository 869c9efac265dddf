"""Fleet analytics: questions asked of the lakes of many nodes at once (``aaco fleet``), see docs/fleet.md."""
