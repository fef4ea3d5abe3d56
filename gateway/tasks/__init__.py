"""Background tasks, the gateway's side: the API's data functions (`tasks`), sending to the
worker (`dispatch`) and the routes, public and internal. Their tables are the worker's."""
