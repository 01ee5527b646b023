#!/bin/bash
if [ "$(cat /app/hello.txt 2>/dev/null)" = "Hello, world!" ] && [ "$(tail -c1 /app/hello.txt | od -An -c | tr -d ' ')" = '\n' ]; then
  echo 1 > /logs/verifier/reward.txt
  echo "PASS: hello.txt is correct"
else
  echo 0 > /logs/verifier/reward.txt
  echo "FAIL: /app/hello.txt missing or wrong"
fi
