"""Remote modules: the protocol, and the engine's side of both transports."""
