from sandfleet.cli import main

main()
