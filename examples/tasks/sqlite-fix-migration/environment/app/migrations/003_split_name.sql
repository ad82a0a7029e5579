-- Split users.full_name into first_name / last_name.
CREATE TABLE users_new (
    id INTEGER PRIMARY KEY,
    first_name TEXT NOT NULL,
    last_name TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
INSERT INTO users_new (id, first_name, last_name, created_at)
    SELECT id,
           substr(full_name, 1, instr(full_name, ' ')),
           substr(full_name, instr(full_name, ' ')),
           created_at
    FROM users;
DROP TABLE users;
ALTER TABLE users_new RENAME TO users;
