"""`monitor fleet`: every station's status and alarms from the broker's retained topics.

`view` folds MQTT messages into the fleet's picture (pure, clock injected);
`service` connects it to a broker and sends acknowledgements on a person's
behalf; `app` serves the page and the JSON API. No central service of ours: the
broker (and its ACL) is the only shared part.
"""
