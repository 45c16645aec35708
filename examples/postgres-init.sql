-- n8n keeps its own tables in a database of its own; chatloom's (and n8n_chat_histories) live in
-- the `chatloom` database that POSTGRES_DB creates.
CREATE DATABASE n8n OWNER chatloom;
