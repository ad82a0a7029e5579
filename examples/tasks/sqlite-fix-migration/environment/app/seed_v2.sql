-- Sample data for a database at schema version 2 (after 001 and 002).
INSERT INTO users (id, full_name, email, created_at) VALUES
  (1, 'Ada Lovelace', 'ada@example.com', '2024-01-02 10:00:00'),
  (2, 'Grace Brewster Hopper', 'grace@example.com', '2024-01-03 11:00:00'),
  (3, 'Linus', 'linus@example.com', '2024-01-04 12:00:00'),
  (4, 'Alan Turing', NULL, '2024-01-05 13:00:00');
