"""Field sources: the Modbus poller and MQTT ingest hand `Sample`s to an `Emit`;
replay reads CSV history into NumPy arrays for the engine's batch path."""
