"""kvres.cluster: what drivers touch (connect, SessionManager, Session, config, metrics, CLI)."""
