from stayer.cli import main

main()
