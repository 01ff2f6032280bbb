"""Field sources: Modbus poller, MQTT ingest, replay. Each hands `Sample`s to an `Emit`."""
